"""The user's inputs, read in one place: prompt files (`prompts`), dataset files (`datasets`, whose
formats `records` reads), and the file and line handling both share (`files`)."""
