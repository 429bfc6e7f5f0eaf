"""In-process recovery: the healthy ranks of a job keep their processes when a rank is lost (``restartable``)."""
