"""Contracts and plumbing shared by every WhaleFlux service."""
