"""lm-eval scoring of the zoo_capitals_gen task: whether the answer names the capital."""


def names_the_capital(doc: dict, results: list[str]) -> dict[str, int]:
    return {"names_capital": int(doc["capital"].lower() in results[0].lower())}
