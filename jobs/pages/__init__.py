"""The pages stage: the job pages, the tokens and webhook pages, the capacity page, and what they show."""
