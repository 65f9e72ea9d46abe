"""README.md is the front page, the reference lives in docs/, and both stay true against the code:
the README is at most 300 lines; every relative link of README.md and docs/*.md reaches a file
(and, for a Markdown file, a heading) that exists; every `autotune ...` line of their ```bash
blocks is a command line the installed CLI accepts (the command exists, every option it names
exists and takes the value given, its arguments fit), parsed by click without running anything;
the README's command table lists exactly the commands `autotune --help` lists; docs/search.md names
every trial outcome of the enum; docs/architecture.md's floors are those tests/test_layout.py holds."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from autotune.cli import main
from autotune.errors import AutotuneError

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 300

FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```[ \t]*$", flags=re.S | re.M)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")
SHELL_OPERATOR = re.compile(r"[0-9]*[<>|&;].*")  # where the command's own words end: > file, | pipe, && ...


def command_words(line: str) -> list[str]:
    """The words of `autotune ...` on a shell line: comments, leading VAR=value assignments and
    anything from a redirection, pipe or list operator on left out."""
    words = shlex.split(re.sub(r"(?:^|\s)#.*", "", line))  # as bash: `#` starts a comment only as a word
    while words and ENV_ASSIGNMENT.fullmatch(words[0]):
        words.pop(0)
    for i, word in enumerate(words):
        if SHELL_OPERATOR.fullmatch(word):
            return words[:i]
    return words


def prose(text: str) -> str:
    """The text outside fenced code blocks (a `# comment` in a bash block is no heading)."""
    return FENCE.sub("", text)


def slugs(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file: lower case, punctuation dropped
    (hyphens and underscores kept), spaces as hyphens, a repeated one suffixed -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", prose(path.read_text(encoding="utf-8")), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def relative_links(path: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(prose(path.read_text(encoding="utf-8")))
        if not re.match(r"[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


def bash_command_lines(path: Path) -> list[str]:
    """Each line of the file's ```bash blocks (continuation lines joined) that runs `autotune`,
    after any VAR=value assignments."""
    lines = []
    text = path.read_text(encoding="utf-8")
    for block in re.findall(r"^[ \t]*```bash\n(.*?)^[ \t]*```", text, flags=re.S | re.M):  # in a list too
        for line in re.sub(r"\\\n[ \t]*", " ", block).splitlines():
            words = command_words(line)
            if words and words[0] == "autotune":
                lines.append(line)
    return lines


def parse(line: str) -> None:
    """Parse one `autotune ...` line as the installed CLI would, up to (not including) running
    the command: click raises on an unknown command or option, a missing value, a value the
    option's type refuses (autotune's types raise UsageError) or a wrong count of arguments."""
    args = command_words(line)[1:]
    assert not any(word.startswith("[") for word in args), f"a synopsis ([optional]), not a command: {line!r}"
    while args and args[0] in ("-v", "--verbose"):  # the group's own option
        args.pop(0)
    assert args, f"no command in {line!r}"
    group = click.Context(main, info_name="autotune")
    command = main.get_command(group, args[0])
    assert command is not None, f"{args[0]!r} is no autotune command: {line!r}"
    try:
        with group:
            command.make_context(args[0], args[1:], parent=group)
    except click.exceptions.Exit as done:  # --help, --version: parsed, and they exit 0
        assert done.exit_code == 0, line


def test_the_readme_is_at_most_300_lines():
    count = len(README.read_text(encoding="utf-8").splitlines())
    assert count <= MAX_README_LINES, f"README.md has {count} lines (at most {MAX_README_LINES}): move text to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_heading_that_exist(page):
    broken = []
    for target in relative_links(page):
        file, _, anchor = target.partition("#")
        where = (page.parent / file).resolve() if file else page
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in slugs(where):
            broken.append(f"{target}: no heading #{anchor} in {where.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_has_autotune_commands_to_check():
    """Not vacuous: the README's bash blocks hold the install-and-run commands and more."""
    assert len(bash_command_lines(README)) >= 5


@pytest.mark.parametrize(
    "line",
    [pytest.param(line, id=f"{page.name}: {line.strip()[:60]}") for page in PAGES for line in bash_command_lines(page)],
)
def test_every_autotune_command_in_a_bash_block_parses(line):
    parse(line)


@pytest.mark.parametrize(
    "line",
    [
        "autotune serch --model gpt2",  # no such command
        "autotune search --model gpt2 --n-trial 40",  # no such option
        "autotune search --model gpt2 --memory-limit sixty",  # a value its type refuses
        "autotune bench --model",  # an option without its value
        "autotune compare a.db b.db [--json | --markdown]",  # a synopsis, not a command line
        "autotune search --model gpt2 --timeout 3h30m",  # a duration units.parse_duration refuses
    ],
)
def test_a_wrong_command_line_is_caught(line):
    with pytest.raises((AssertionError, click.ClickException, AutotuneError)):
        parse(line)


def test_redirections_and_pipes_end_the_command():
    assert command_words("autotune export r.json --format decode-loop > decode.py  # a script") == [
        "autotune", "export", "r.json", "--format", "decode-loop"
    ]  # fmt: skip
    assert command_words("AUTOTUNE_STORAGE=x autotune show --study s | head") == ["autotune", "show", "--study", "s"]
    assert command_words("autotune compare postgresql://db/autotune#gpt2 a.db  # two") == [
        "autotune", "compare", "postgresql://db/autotune#gpt2", "a.db"
    ]  # fmt: skip
    parse("autotune export r.json --format decode-loop > decode.py")


def test_the_readme_command_table_lists_every_command():
    """The README's command table is `autotune --help`'s list of commands, no more, no less."""
    text = README.read_text(encoding="utf-8")
    table = re.search(r"^\| command \| what it does \|\n\|---\|---\|\n((?:\|.*\n)+)", text, flags=re.M)
    assert table, "no '| command | what it does |' table in README.md"
    listed = re.findall(r"^\| `autotune ([a-z-]+)` \|", table.group(1), flags=re.M)
    assert sorted(listed) == sorted(main.commands), "the README's command table differs from `autotune --help`"


def test_the_search_page_names_every_trial_outcome():
    from autotune.measure.outcomes import Outcome

    text = (ROOT / "docs" / "search.md").read_text(encoding="utf-8")
    item = re.search(r"^- Outcomes, decided in one place.*?(?=^- |^#|\Z)", text, flags=re.S | re.M)
    assert item, "no '- Outcomes, decided in one place' item in docs/search.md"
    named = set(re.findall(r"`([a-z_]+)`", item.group(0)))
    assert {outcome.value for outcome in Outcome} - named == set(), "docs/search.md leaves outcomes out"


def test_the_architecture_page_gives_the_floors_the_layout_test_holds():
    from tests.test_layout import LAYERS

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"^    cli\n(?:    [a-z_, ]+\n)+", text, flags=re.M)
    assert block, "no floor diagram (an indented block from `cli` down) in docs/architecture.md"
    floors = [sorted(name.strip() for name in line.split(",")) for line in block.group(0).splitlines()]
    levels = sorted(set(LAYERS.values()), reverse=True)
    expected = [
        sorted(name for name, level in LAYERS.items() if level == floor and name != "_version") for floor in levels
    ]
    assert floors == expected
