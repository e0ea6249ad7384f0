"""Where a student's kernel runs: the bubblewrap launcher and its capped file systems (``launch``), the syscall
profile every process of a sandbox runs under (``syscall_profile``), one control group per sandbox (``cgroups``) and
one uid per live sandbox (``uids``).

May import: ``decoder_course`` only (the lowest room; it knows nothing of lessons or grades). Start here for a new
attack on the machine: a resource a notebook can exhaust, a kernel facility it can reach.
"""
