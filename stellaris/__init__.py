"""stellaris package."""
