"""Stand-ins shared by the tests, for what cannot run on a CPU-only machine."""
