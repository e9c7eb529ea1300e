"""The panels of the vtui screen. Each renders a SessionSnapshot and sends past-tense messages."""
