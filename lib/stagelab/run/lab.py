"""JupyterLab as a user expects it: saving a project notebook leaves it unchanged in git.

``make lab`` puts the project's ``jupyter/`` folder on ``JUPYTER_CONFIG_PATH``; its
``jupyter_server_config.json`` names :func:`strip_outputs` as the contents manager's
``pre_save_hook``, makes the project's kernel the default and turns Lab's news feed and update
check off; ``jupyter/lab/overrides.json`` (Lab's application settings, ``make lab`` passes the
folder) answers the news prompt "never" and starts the notebook's kernel without asking. A
notebook run in Lab keeps
its outputs on screen; its evidence is the interactive run folder it writes under
``papermill_runs/``, never the tracked notebook.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stagelab.core import paths

CONFIG_DIR = paths.REPO_ROOT / "jupyter"


def is_tracked(os_path: Path) -> bool:
    """Whether a notebook file is one of the project's own, committed without outputs (a
    notebook directly in ``notebooks/``)."""
    return Path(os_path).resolve().parent == paths.NOTEBOOKS_DIR.resolve()


# What Lab adds to a cell as the user views it (collapsed, scrolled, timings, hidden source):
# view state, never committed.
VIEW_STATE = ("collapsed", "scrolled", "execution", "jupyter")


def strip_outputs(model: dict[str, Any], path: str, contents_manager: Any,
                  **_kwargs: Any) -> None:
    """Jupyter's ``pre_save_hook``: a tracked notebook is saved as committed, with no outputs,
    execution counts or view state, and ``language_info`` only naming its language (before: a
    kernel's ``language_info`` (version, mimetype, ...) made every saved notebook show as
    modified in git); every other file as it is."""
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    if not is_tracked(Path(contents_manager.root_dir) / path.lstrip("/")):
        return
    metadata = model["content"].get("metadata", {})
    if isinstance(metadata.get("language_info"), dict):
        metadata["language_info"] = {"name": metadata["language_info"].get("name", "python")}
    for cell in model["content"].get("cells", []):
        for key in VIEW_STATE:
            cell.get("metadata", {}).pop(key, None)
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
