"""The submission stage: the form (the one validator), who may see and do what, the job saved then queued,
stops, and the tasks asked for by name."""
