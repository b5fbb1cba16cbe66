"""Celery entry points: thin tasks that call one service each."""
