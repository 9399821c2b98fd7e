"""A job's log: storing lines in order under a cap, reading and following them, and the progress channel."""
