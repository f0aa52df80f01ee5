"""The loss tolerances within which two runs are NUMERICALLY_EQUIVALENT (verify, restore): one place."""

DEFAULT_RTOL = 1e-5
DEFAULT_ATOL = 1e-8
