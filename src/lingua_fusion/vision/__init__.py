"""Sign-language and lip landmarks: extraction (mediapipe in a worker process), normalisation, dynamic time
warping, a recogniser taught per API key, adaptive frame sampling, and fusion with speech.

Isolated recognition of a vocabulary the user teaches, not sign-language translation: see docs/video.md.
"""
