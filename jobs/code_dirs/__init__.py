"""Code directories, in three parts: what an archive may hold (policy, plain Python), the process that
writes one (unpacker, run by exec with a dropped account), and the console's side (service: uploads,
the shipped examples, names)."""
