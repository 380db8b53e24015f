"""A run's contention, in one place: the kernel's counters of a process's threads and cores
(probes), what the machine gave each rank during an epoch (conditions) and the meter that gathers
it over the ranks (meter), and the `contended` mark on a study point's row and the filter every
reader of points.tsv applies (marks)."""
