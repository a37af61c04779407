"""How the KV server reads HTTP/1.1: request heads, names, query strings, and the head of an
answer. Pure functions; a request that cannot be read raises BadRequest."""
import re
import sys
from urllib.parse import unquote, unquote_to_bytes

from hvdlite.worker import kvproto

MAX_BODY = kvproto.MAX_BODY
MAX_HEAD = kvproto.MAX_HEAD
MAX_NAME = 512
METHODS = ("GET", "PUT", "POST", "DELETE")
AUTH = kvproto.AUTH_HEADER.lower()
DIGITS = re.compile(r"[0-9]+")
INTEGER = re.compile(r"[+-]?[0-9]+")
INTERNAL = b"internal error of the KV server (said on the driver's stderr)"
_PERCENT_OK = re.compile(r"(?:[^%]|%[0-9A-Fa-f]{2})*")
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 408: "Request Timeout", 413: "Payload Too Large",
            431: "Request Header Fields Too Large", 500: "Internal Server Error",
            503: "Service Unavailable"}


class BadRequest(Exception):
    """args: (status, reason bytes[, server time]) to answer and close the connection, or
    (message,) for a request read whole whose route refuses it with 400."""


def read_head(head: bytes):
    """(method, target, headers, Content-Length values) of a request head; the header names
    are lower-cased, and of a repeated one the first counts (two signatures count as none)."""
    lines = head.decode("latin-1").split("\r\n")
    words = lines[0].split(" ")
    if len(words) != 3 or not words[2].startswith("HTTP/1.") or not words[1].startswith("/"):
        raise BadRequest(400, b"bad request line")
    headers, lengths = {}, []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(400, b"bad header line")
        name = name.lower()
        value = value.strip()
        if name == "content-length":
            lengths.append(value)
        elif name == AUTH and name in headers:
            headers[name] = ""  # two signatures: which one would count is anybody's guess
        headers.setdefault(name, value)
    return words[0], words[1], headers, lengths


def body_framing(method, headers, lengths):
    """(body length, whether the client waits for 100 Continue, whether it closes after the
    answer) of a request whose signature checked out."""
    if method not in METHODS:
        raise BadRequest(405, b"method not allowed")
    if "transfer-encoding" in headers:
        raise BadRequest(400, b"Transfer-Encoding is not supported; send Content-Length")
    lengths = lengths or ["0"]
    if len(lengths) != 1 or not DIGITS.fullmatch(lengths[0]):
        raise BadRequest(400, b"bad Content-Length")
    length = int(lengths[0])
    if length > MAX_BODY:
        raise BadRequest(413, b"body over 64 MiB")
    expects = headers.get("expect", "").lower() == "100-continue"
    return length, expects, headers.get("connection", "").lower() == "close"


def answer_head(status: int, length: int, extra: str = "") -> bytes:
    return f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\nContent-Length: {length}\r\n{extra}\r\n" \
        .encode("latin-1")


def decode_segment(raw: str) -> str:
    """A scope or key: a percent-encoded path segment, 1..MAX_NAME bytes of UTF-8 once decoded."""
    if not _PERCENT_OK.fullmatch(raw):
        raise BadRequest("bad percent-encoding")
    data = unquote_to_bytes(raw)
    if not 0 < len(data) <= MAX_NAME:
        raise BadRequest(f"names must be 1..{MAX_NAME} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("names must be UTF-8") from None


def parse_query(raw: str) -> dict:
    """name=value&... as parse_qsl(strict) reads it, the last of a repeated name counting;
    without its cost on the plain fields every request has."""
    query = {}
    if raw:
        for field in raw.split("&"):
            name, eq, value = field.partition("=")
            if not eq:
                raise BadRequest("bad query string")
            query[_unquote(name)] = _unquote(value)
    return query


def _unquote(text: str) -> str:
    text = text.replace("+", " ")
    if "%" not in text:
        return text
    try:
        return unquote(text, errors="strict")
    except UnicodeDecodeError:
        raise BadRequest("bad query string") from None


def seconds(query) -> float:
    """The wait=S of a long-poll."""
    try:
        value = float(query["wait"])
    except ValueError:
        raise BadRequest("wait must be a number of seconds") from None
    if not 0 <= value < float("inf"):
        raise BadRequest("wait must be a number of seconds")
    return value


def internal(error: BaseException):
    """The answer to a request the server failed on: 500 with no text of the error's (it may
    quote what the client sent, and tells an outsider about the server); the error goes to the
    driver's stderr, on one line, escaped."""
    try:
        print(f"hvdlite: KV server: internal error: {ascii(f'{type(error).__name__}: {error}')[1:-1]}",
              file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
    return 500, INTERNAL
