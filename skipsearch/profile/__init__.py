"""Draft profiles: the portable YAML file that says how to self-speculatively decode one model.

People write and read these by hand and share them between teams, so the keys are a contract: every load validates
everything, and every error is one line naming the file and the key. The document (its parts, reading, writing,
the model check) is ``document.py``; the schema versions and their upgrades are ``schema.py``. A profile names a
method, whose parameters and records the method registry validates, so this package sits above ``methods/``; the
formats every layer reads (cost file, schedule, records, bounds) are ``files/``.
"""

from skipsearch.hardware import Environment
from skipsearch.profile.document import (
    MAX_PROFILE_BYTES,
    Measured,
    ModelRef,
    Profile,
    SearchInfo,
    check_model,
    check_profile_target,
    engine_run,
    load_profile,
    profile_from_dict,
    profile_to_dict,
    save_profile,
    with_engine_run,
    without_engine_run,
)
from skipsearch.profile.schema import (
    BASELINE_HF_GREEDY,
    BASELINE_OURS_AR,
    BASELINE_PREDICTED,
    BASELINES,
    OLD_BASELINE_KEY,
    SCHEMA_VERSION,
    upgrade,
)

__all__ = ["BASELINES", "BASELINE_HF_GREEDY", "BASELINE_OURS_AR", "BASELINE_PREDICTED", "MAX_PROFILE_BYTES",
           "OLD_BASELINE_KEY", "SCHEMA_VERSION", "Environment", "Measured", "ModelRef", "Profile", "SearchInfo",
           "check_model", "check_profile_target", "engine_run", "load_profile", "profile_from_dict", "profile_to_dict",
           "save_profile", "upgrade", "with_engine_run", "without_engine_run"]
