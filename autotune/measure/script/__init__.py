"""Script mode: copies of the user's script, the first copy, the long-lived copy, fresh process pairs of
copies (``ScriptMeasurer``) and what a script-mode trial's result says.
"""
