"""The step rank 0 has reached, in LOG_DIR/progress, for tests that act at a given step."""
import os


def write_progress(log_dir: str, step: int) -> None:
    tmp = os.path.join(log_dir, "progress.tmp")
    with open(tmp, "w") as f:
        f.write(str(step))
    os.replace(tmp, os.path.join(log_dir, "progress"))  # readers never see a half-written file
