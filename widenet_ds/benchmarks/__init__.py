"""Finetuning tasks as data: GLUE and SQuAD readers, features, decoding and official metrics.

Each task is a small registry entry (files, columns, labels, metric, recipe); the finetuning loop is
shared and never branches on a task name beyond looking the entry up.
"""
