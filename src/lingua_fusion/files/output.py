"""Which output formats fit which output modality: one check for the REST API and the CLI, before any work.

    json      any output (speech: the WAV as audio_base64)
    text      text, or braille cells
    srt, vtt  text captions with timestamps (braille and speech have no caption form)
    wav       speech only
"""

from __future__ import annotations

from ..errors import InvalidParameter

FORMATS = ("json", "text", "srt", "vtt", "wav")
FITS = {"json": {"text", "speech", "braille"}, "text": {"text", "braille"}, "srt": {"text"}, "vtt": {"text"},
        "wav": {"speech"}}


def check_output_format(fmt: str, target_modality: str) -> None:
    """Raise ``invalid_parameter`` (field output_format) when ``fmt`` cannot carry ``target_modality``."""
    if fmt not in FITS:
        raise InvalidParameter(f"output_format must be one of {', '.join(FORMATS)}, not {fmt!r}",
                               details={"field": "output_format"})
    modality = target_modality.strip().lower()
    if modality in FITS["json"] and modality not in FITS[fmt]:
        fitting = [f for f in FORMATS if modality in FITS[f]]
        needs = " or ".join(sorted(FITS[fmt]))
        raise InvalidParameter(f"output_format {fmt} needs target_modality {needs}, not {modality}; for "
                               f"{modality} output use output_format {', '.join(fitting)}",
                               details={"field": "output_format", "fits": fitting})
