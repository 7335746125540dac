"""The shipped scaling profiles are exactly what their script derives.

`datasets/profiles/scaling/*.json` are derived by
`datasets/scripts/derive_scaling_profiles.py`; regenerating them into a
temporary folder must reproduce every shipped file, value for value, and
every file must load as a valid `ScalingProfile`.
"""

from __future__ import annotations

import json
from pathlib import Path

from thrifty.perfmodels.scaling import load_scaling_profile

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "datasets" / "scripts" / "derive_scaling_profiles.py"
SHIPPED = ROOT / "datasets" / "profiles" / "scaling"


def _script():
    return load_script(SCRIPT)


def test_regenerating_reproduces_every_shipped_file(tmp_path):
    written = _script().derive(tmp_path)
    shipped = sorted(p.name for p in SHIPPED.glob("*.json"))
    assert sorted(p.name for p in written) == shipped
    for path in written:
        assert json.loads(path.read_text()) == json.loads((SHIPPED / path.name).read_text()), path.name


def test_every_shipped_scaling_profile_loads_and_says_it_is_derived():
    for path in SHIPPED.glob("*.json"):
        profile = load_scaling_profile(str(path), "")
        doc = json.loads(path.read_text())
        assert doc["provenance"]["kind"] == "derived"
        assert "derive_scaling_profiles.py" in doc["provenance"]["script"]
        means = [profile.iteration(g)[0] for g in (1, 2, 4, 8)]
        assert all(m > 0 for m in means)
