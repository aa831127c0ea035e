import os

from hypothesis import HealthCheck, settings

_common = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("default", max_examples=150, **_common)
settings.register_profile("ci", max_examples=150, derandomize=True, **_common)
settings.register_profile("long", max_examples=5000, **_common)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default")
)
