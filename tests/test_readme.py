"""The README's "Using it" commands run as written, in order, in a fresh copy of the repository.

The one deviation: ``anysr train`` lines get ``--force_yml`` overrides that shorten the quick start to a few
iterations (the full run is what ``make demo`` does; here it would take minutes). Everything else, every flag and
every path, is the README's own text. Afterwards nothing the commands wrote may show up in ``git status``: all
outputs land in git-ignored folders.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

SHORT_TRAINING = ["--force_yml", "train.total_iter=8", "val.val_freq=8", "logger.save_checkpoint_freq=8",
                  "logger.print_freq=4", "datasets.train.num_worker_per_gpu=0"]


def readme_commands(text: str) -> list[list[str]]:
    """The commands of the first ```bash block after '## Using it', continuation lines joined, comments dropped."""
    section = text[text.index("## Using it"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README: no ```bash block under '## Using it'"
    joined = block.group(1).replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]


def fresh_copy(dest: Path) -> Path:
    """The repository's files as a clone would have them (tracked + new, not ignored), as a git repository."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    for cmd in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy"]):
        subprocess.run(["git", *cmd], cwd=dest, check=True, capture_output=True)
    return dest


def test_readme_block_is_parsed() -> None:
    commands = readme_commands((ROOT / "README.md").read_text())
    assert len(commands) >= 8 and all(c[0] == "anysr" for c in commands)
    assert [c[1] for c in commands][:2] == ["train", "test"]


def test_readme_is_one_page_whose_links_and_count_hold() -> None:
    """At most 8,000 characters; every relative link names a file of the repository (anchors: a heading of it);
    the number of registered network types it states is the registry's."""
    import anysr.archs  # noqa: F401  (fills the registry)
    from anysr.registry import ARCH_REGISTRY

    text = (ROOT / "README.md").read_text()
    assert len(text) <= 8000, f"README.md is {len(text)} characters: move detail to docs/"
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert len(links) >= 10
    for link in links:
        if link.startswith("http"):
            continue
        path, _, anchor = link.partition("#")
        assert (ROOT / path).exists(), link
        if anchor:
            headings = re.findall(r"^#+ (.+)$", (ROOT / path).read_text(), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
            assert anchor in slugs, link
    count = re.search(r"(\d+) registered network types", text)
    assert count and int(count.group(1)) == len(ARCH_REGISTRY.keys())


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to list the repository's files")
def test_readme_commands_run_in_order_on_a_fresh_copy(tmp_path: Path) -> None:
    repo = fresh_copy(tmp_path / "anysr")
    outputs = []
    for argv in readme_commands((repo / "README.md").read_text()):
        args = argv[1:] + (SHORT_TRAINING if argv[1] == "train" else [])
        proc = run_cli(*args, cwd=repo, timeout=900)
        outputs.append(proc.stdout + proc.stderr)
    assert "average PSNR=28.43" in outputs[4]  # the published Set5 x4 bicubic number (28.42)
    assert (repo / "results" / "readme" / "T91_sub.lmdb" / "meta_info.txt").is_file()
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=repo, check=True,
                            capture_output=True, text=True).stdout
    assert status == "", f"README commands wrote outside the git-ignored folders:\n{status}"
