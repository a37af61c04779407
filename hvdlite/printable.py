"""Text from files and other processes, made safe for a terminal (torch-free).

A checkpoint's cause quotes names from the file, a path may hold any byte, and a terminal
obeys control sequences (ESC ]0; sets its title, others rewrite what it shows): every control
character but a line's end and a tab is written as \\xNN.
"""
_TABLE = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7f, *range(0x80, 0xa0)) if c not in (0x09, 0x0a)}


def printable(text: str) -> str:
    return text.translate(_TABLE)
