"""The node check before the first step: checkpoint folders, each rank's GPU, an all-reduce with a known answer."""
