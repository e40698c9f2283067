"""Tensor parallelism: the blocks of a traced model that split across ranks
(``shard_plan``), each rank's shard (``sharding``), the check that the ranks together
compute the whole model (``shard_check``), the export of a directory of rank programs
(``export``) and its loading in a process group (``ranks``)."""
