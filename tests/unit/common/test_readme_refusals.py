"""The README's table of refused fields says what ``common.support`` refuses: every refused volume type and pod
field is listed, and no volume type the engine implements or ignores is (the table once still listed
``persistentVolumeClaim`` after the volume plugins had landed)."""

from __future__ import annotations

from pathlib import Path

from common import support

README = Path(__file__).resolve().parents[3] / "README.md"


def _refused_section() -> str:
    text = README.read_text()
    start = text.index("**Refused, never ignored.**")
    return text[start : text.index("Such pods belong to another scheduler", start)]


def test_every_refused_volume_type_is_listed_and_no_other() -> None:
    section = _refused_section()
    for field in support.VOLUME_SOURCES.values():
        name = field.path.rsplit(".", 1)[-1]
        listed = f"`{name}`" in section
        assert listed == (field.status == support.REFUSED), (field.path, field.status)


def test_every_refused_pod_field_is_listed() -> None:
    section = _refused_section()
    for group in (support.SPEC_FIELDS, support.CONTAINER_FIELDS, support.AFFINITY_FIELDS):
        for field in group.values():
            if field.status == support.REFUSED:
                leaf = field.path.removeprefix("spec.").replace("containers[].", "")
                assert leaf in section, field.path
