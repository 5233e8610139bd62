"""The held-out token streams that trace prompts point into."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from specrl.workload.trace import DOMAINS


def token_streams(
    tokenizer,
    documents: Callable[[str], Sequence[str]] | Mapping[str, Sequence[str]] | None = None,
    domains: Sequence[str] = DOMAINS,
) -> dict[str, list[int]]:
    """Each domain's held-out documents, tokenized and joined in order (separated by EOS when
    the tokenizer has one). ``documents``: a mapping or a function ``domain -> [text]``;
    default: ``specrl.models.corpus.held_out_documents``."""
    if documents is None:  # specrl.models imports torch; the workload package stays pure
        from specrl.models.corpus import held_out_documents as documents
    get = documents.__getitem__ if isinstance(documents, Mapping) else documents
    eos = getattr(tokenizer, "eos_token_id", None)
    streams = {}
    for domain in domains:
        ids: list[int] = []
        for text in get(domain):
            ids.extend(tokenizer.encode(text, add_special_tokens=False, verbose=False))
            if eos is not None:
                ids.append(eos)
        streams[domain] = ids
    return streams
