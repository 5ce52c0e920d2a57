"""The launcher, which never runs in a rank: `widenet-ds launch` (its options, the task's options, the ranks started
under DeepSpeed's runner on one or several nodes, stop signals relayed, a failed node's run ended)."""
