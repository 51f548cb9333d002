"""Artifacts of several files shipped as one zip (onnxruntime-genai's model folder, ncnn's param and bin, an
ExecuTorch program and its weights): stored, not deflated (weights do not compress, and an app can read a member in
place), in name order, with fixed times and modes, so that the same files give the same bytes."""

import shutil
import zipfile
from pathlib import Path

FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # zip's earliest date: no build time in the bytes


def write_zip(files, output, comment=b""):
    """`files`: {name in the zip: its bytes, or the path of a file to copy in (streamed: a model's weights may be
    gigabytes)}."""
    with zipfile.ZipFile(output, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.comment = comment
        for name in sorted(files):
            entry = zipfile.ZipInfo(name, date_time=FIXED_TIME)
            entry.external_attr = 0o644 << 16
            content = files[name]
            if isinstance(content, (bytes, bytearray)):
                archive.writestr(entry, content)
                continue
            entry.file_size = Path(content).stat().st_size  # zip64 where the file needs it
            with open(content, "rb") as source, archive.open(entry, "w") as target:
                shutil.copyfileobj(source, target, 1 << 24)


def write_folder(folder, output):
    """Every file below `folder`, named by its path relative to it."""
    write_zip({path.relative_to(folder).as_posix(): path for path in Path(folder).rglob("*") if path.is_file()},
              output)
