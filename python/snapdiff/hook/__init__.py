"""The start-up hook `snapdiff capture` puts on a Python job's path (these
files run there as top-level modules), and the machinery
`snapdiff.recording()` drives in-process."""
