"""The course's machinery: the checkers, show(), the checkers' Chinese, the exercise templates, pitfalls on purpose."""
