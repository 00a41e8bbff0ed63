"""Diarization proof tools: dialogues built from different voices with known turns (dialogue.py) and the error
rate of a labelling against them (der.py). bench/diarize.py and the tests use both."""
