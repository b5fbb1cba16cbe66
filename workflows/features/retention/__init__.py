"""Retention: a finished workflow's checkpoints and events move to an archive file (the history
format of ``workflows.histories``) after AGENTOPS_RETENTION_DAYS, and the state blobs nothing
references any more are deleted. Beat runs it (``tasks.beat``)."""
