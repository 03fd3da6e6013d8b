"""Portable exports of what a phase trained, and the official-release importers' shared report."""
