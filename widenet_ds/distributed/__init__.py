"""In-rank process groups and faults: where this rank sits in the job, the groups (and their parallel layout), how long
a collective may wait, a lost or silent peer named, and what every rank found said once."""
