"""The ground floor: errors, the IO spec and typed option parsing. Imports nothing else of aotforge."""
