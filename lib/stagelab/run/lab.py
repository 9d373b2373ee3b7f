"""JupyterLab as a user expects it: the project's notebooks stay without outputs when saved.

``make lab`` puts the project's ``jupyter/`` folder on ``JUPYTER_CONFIG_PATH``; its
``jupyter_server_config.json`` names :func:`strip_outputs` as the contents manager's
``pre_save_hook`` and turns Lab's news prompt and update check off. A notebook run in Lab keeps
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


def strip_outputs(model: dict[str, Any], path: str, contents_manager: Any,
                  **_kwargs: Any) -> None:
    """Jupyter's ``pre_save_hook``: a tracked notebook is saved with no outputs and no
    execution counts (every other file as it is)."""
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    if not is_tracked(Path(contents_manager.root_dir) / path.lstrip("/")):
        return
    for cell in model["content"].get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
