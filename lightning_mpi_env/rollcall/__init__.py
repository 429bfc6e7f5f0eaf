"""The roll call before ``init_process_group``: a missing, duplicate or disagreeing rank stops every rank, named."""
