"""Sensors: poke the hook and decide; deferrable through the triggers package."""
