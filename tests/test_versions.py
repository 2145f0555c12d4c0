"""``versions.Features``: each version-dependent decision, by ``server_version_num``."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.versions import Features
from tests.support.paths import REPO

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("version", "origins", "inactive_since", "non_superuser"),
    [
        (150010, "max_replication_slots", False, False),
        (160006, "max_replication_slots", False, True),
        (170006, "max_replication_slots", True, True),
        (180001, "max_active_replication_origins", True, True),
    ],
)
def test_features_by_version(
    version: int, origins: str, inactive_since: bool, non_superuser: bool
) -> None:
    features = Features.of(version)
    assert features.major == version // 10000
    assert features.origins_setting == origins
    assert features.slot_inactive_since is inactive_since
    assert features.non_superuser_subscriptions is non_superuser


def test_every_place_that_names_the_supported_versions_agrees() -> None:
    """versions.SUPPORTED_MAJORS is what the matrix runs (Makefile), what the provider metadata,
    README and docs/versions.md say: a version added or dropped in one place fails here."""
    import re

    from airflow_pglogrepl.get_provider_info import get_provider_info
    from airflow_pglogrepl.versions import SUPPORTED_MAJORS

    repo = REPO
    makefile = (repo / "Makefile").read_text()
    matrix = re.search(r"^PG_MATRIX \?= (.*)$", makefile, re.M)
    fetched = re.search(r"^PG_BINARIES := (.*)$", makefile, re.M)
    assert matrix is not None and fetched is not None
    others = tuple(int(v) for v in matrix.group(1).split())
    assert (SUPPORTED_MAJORS[0], *others) == SUPPORTED_MAJORS
    assert tuple(int(spec.split("=")[0]) for spec in fetched.group(1).split()) == others
    first, last = SUPPORTED_MAJORS[0], SUPPORTED_MAJORS[-1]
    assert f"PostgreSQL {first} to {last}" in get_provider_info()["description"]
    listed = ", ".join(str(v) for v in SUPPORTED_MAJORS[:-1]) + f" and {last}"
    assert f"**{listed}**" in (repo / "README.md").read_text()
    versions_doc = (repo / "docs" / "versions.md").read_text()
    assert f"**Supported: PostgreSQL {listed}**" in versions_doc
    rows = {int(m) for m in re.findall(r"^\| (\d\d) \|", versions_doc, re.M)}
    assert rows == set(SUPPORTED_MAJORS)
