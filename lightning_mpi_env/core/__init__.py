"""The standard-library core: the launch read once into a ``RankLayout``, the launcher and scheduler tables, errors."""
