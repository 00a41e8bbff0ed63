"""The file path: one request (a file or a text) in, one TranslationResult out. Knows nothing of HTTP."""

from .translator import FileRequest, FileTranslator, ValidRequest

__all__ = ["FileRequest", "FileTranslator", "ValidRequest"]
