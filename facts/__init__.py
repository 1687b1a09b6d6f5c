"""Readings of the Sparks' state, one pyinfra fact per thing read."""
