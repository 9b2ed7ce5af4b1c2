"""The ground floor: the one exception type and the input checks every reader shares.

Imports nothing of the project, so workloads/, hwmodels/ and dse/ all build on it."""
