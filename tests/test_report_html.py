"""report.html from hand-made rows and verdict lines: self-contained, the ids a browser check looks for, one row per
configuration, every run-derived string escaped, the pictures inline when they exist and absent when not."""

from __future__ import annotations

import base64
from html.parser import HTMLParser

from sweeplab.report import html as report_html
from sweeplab.report.html import Table

COLUMNS = ["configuration", "samples/s", "val/cos", "quality"]
EVIL = "bs=8 <script>alert(1)</script> \"q\" & 'a'"
LABELS = ["bs=32 α=1", "bs=32 α=0.7", "bs=64 α=1", "bs=64 α=0.7", "bs=128 α=1", "bs=128 α=0.7", "bs=256 α=1", EVIL]
VERDICT = ("fastest to val/cos ≥ 0.7: bs=64 α=0.7, 1.9× the baseline's speed",
           "  bs=64 α=0.7: 1.90× the baseline's speed to the target (1.5×–2.4×, 99.2% simultaneous interval, 5 pairs)",
           "note: validation is coarse")


class Elements(HTMLParser):
    """Every start tag with its attributes, and the text inside each element that has an id."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: dict[str, str] = {}
        self._open: list[str | None] = []

    def handle_starttag(self, tag, attrs):
        attributes = {k: v or "" for k, v in attrs}
        self.tags.append((tag, attributes))
        if tag not in ("img", "meta", "br", "input"):
            self._open.append(attributes.get("id"))
            if attributes.get("id"):
                self.text[attributes["id"]] = ""

    def handle_endtag(self, tag):
        if self._open and tag not in ("img", "meta", "br", "input"):
            self._open.pop()

    def handle_data(self, data):
        for ident in filter(None, self._open):
            self.text[ident] += data


def _configurations() -> Table:
    rows = [{"configuration": label, "samples/s": f"{100 + i} ({90 + i}–{110 + i})", "val/cos": "0.7 (0.69–0.71)",
             "quality": "baseline" if i == 0 else "keeps"} for i, label in enumerate(LABELS)]
    return Table(COLUMNS, rows, "configuration", above=("every configuration: n 5",), below=("legend",), intervals=True)


def _jobs() -> Table:
    return Table(["run", "samples/s"], [{"run": f"{label} rep=0", "samples/s": "1,234"} for label in LABELS], "run")


def _parse(page: str) -> Elements:
    parser = Elements()
    parser.feed(page)
    parser.close()
    return parser


def _assert_self_contained(page: str, parsed: Elements) -> None:
    assert "<link" not in page.lower() and "@import" not in page and "url(" not in page
    for tag, attributes in parsed.tags:
        for name in ("src", "href"):
            value = attributes.get(name, "")
            assert not value.lower().startswith(("http:", "https:", "//")), (tag, name, value[:80])
        assert not (tag == "script" and "src" in attributes)  # inline script only
        if tag == "img":
            assert attributes["src"].startswith("data:image/png;base64,")
    assert "http://" not in page and "https://" not in page


def test_the_page_is_self_contained_with_the_verdict_the_table_and_the_pictures_inline(tmp_path):
    pictures = {}
    for name in ("speed_quality.png", "curves.png", "throughput.png"):
        pictures[name] = b"\x89PNG\r\n\x1a\n" + name.encode() * 50
        (tmp_path / name).write_bytes(pictures[name])
    (tmp_path / "objective.png").write_bytes(b"\x89PNG not for the page")
    page = report_html.page("sweep 2026-01-02/03-04-05", VERDICT, _configurations(), _jobs(),
                            [tmp_path / n for n in ("throughput.png", "curves.png", "speed_quality.png", "objective.png")])
    parsed = _parse(page)
    _assert_self_contained(page, parsed)

    assert "<section id=\"verdict\">" in page and "fastest to val/cos ≥ 0.7: bs=64 α=0.7" in parsed.text["verdict"]
    assert "1.90× the baseline's speed to the target" in parsed.text["verdict"]
    rows = [a["data-config"] for t, a in parsed.tags if t == "tr" and "data-config" in a]
    configuration_rows = rows[:len(LABELS)]
    assert configuration_rows == LABELS  # one per configuration, the attribute unescaped back to the label
    assert "samples/s" in parsed.text["configurations"] and "100 (90–110)" in parsed.text["configurations"]
    assert "0.7 (0.69–0.71)" in parsed.text["configurations"]
    assert page.index('id="verdict"') < page.index('id="configurations"') < page.index('id="speed-quality"')
    assert page.index('id="curves"') < page.index("<details>") < page.index('id="jobs"')  # the jobs last, folded

    # the label reaches the page as text, never as markup (the page's one script is its own sorter)
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert sum(1 for t, _ in parsed.tags if t == "script") == 1

    images = {a["id"]: a["src"] for t, a in parsed.tags if t == "img"}
    assert list(images) == ["speed-quality", "curves", "throughput"]  # objective.png has no place on the page
    assert base64.b64decode(images["speed-quality"].split(",", 1)[1]) == pictures["speed_quality.png"]
    assert base64.b64decode(images["curves"].split(",", 1)[1]) == pictures["curves.png"]


def test_without_pictures_or_replicates_the_page_has_the_jobs_table_and_says_why_there_is_no_verdict():
    line = "one replicate: no verdict (an interval needs at least two replicates of a configuration)"
    page = report_html.page("sweep x", (line,), _jobs())
    parsed = _parse(page)
    _assert_self_contained(page, parsed)
    assert "<img" not in page and "<figure" not in page and "<details>" not in page and 'id="jobs"' not in page
    assert parsed.text["verdict"].strip() == line
    rows = [a["data-config"] for t, a in parsed.tags if t == "tr" and "data-config" in a]
    assert rows == [f"{label} rep=0" for label in LABELS]  # one row per job, in the table the check looks for
    assert "1,234" in parsed.text["configurations"]


def test_a_picture_that_cannot_be_read_is_left_out(tmp_path):
    page = report_html.page("sweep x", VERDICT, _configurations(), figures=[tmp_path / "curves.png"])
    assert "<img" not in page and "<figure" not in page and 'id="configurations"' in page
