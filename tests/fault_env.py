"""The environment variables through which tests talk to the fault models (tests/fault_models.py)
in trial processes: here, apart from the models, so that a test module reading them imports no
torch when it is collected (tests/test_collection.py)."""

# Where `hang` writes the pid of the child it starts, when the test asks for it.
PIDFILE_ENV = "AUTOTUNE_TEST_PIDFILE"
# Where `full_disk` counts its builds (one line each), across the processes that build it.
BUILDS_ENV = "AUTOTUNE_TEST_BUILDS"
# Where rank_1_raises and rank_1_hangs note each rank's pid and rendezvous port.
RANKS_DIR_ENV = "AUTOTUNE_TEST_RANKS_DIR"
