"""Exceptions raised by the retrieval package; the apps map them to API errors."""


class RetrievalError(Exception):
    """Root of every error this package raises."""


class EmbedderUnavailable(RetrievalError):
    """The embedding model cannot be loaded; the message says what to set or install."""


class IndexCorrupted(RetrievalError):
    """An index file cannot be read or does not match what was expected of it."""


class UnsupportedDocument(RetrievalError):
    """The bytes given are not a document of the declared type, or not one we can read.

    ``code`` names the failure for the document's ``error`` (``unsupported_document``, or
    ``parser_crashed`` when the parser's process died on the file)."""

    def __init__(self, message: str, *, code: str = "unsupported_document") -> None:
        super().__init__(message)
        self.code = code


class DocumentTooLarge(RetrievalError):
    """The document exceeds a configured limit (pages, characters, HTML elements, chunks,
    the parser's time or memory)."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code
