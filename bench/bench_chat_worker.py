"""What a render worker spends on a chat record: the render, then the encoding and masks with the tokenizer's
offsets or with the offsets from the ids (umlos_cuda/batching/chat/byte_offsets.py), side by side.

One process, bench_chat_tokenize.py's conversations and byte-level BPE (ChatML without markers), cut in chunks
of ``--chunk`` records as the render workers get them. Times are CPU seconds of this process
(``TOKENIZERS_PARALLELISM=false``: one thread encodes, as in a worker) per record: the render of every chunk
once (``ChatRender``), then ``encode_chunk`` (the token store's work on a rendered chunk: ids and assistant
masks) with the offsets asked of the tokenizer (``encode_batch``, its offsets as tuples, ``chunk_masks``) and
with them from the ids (``encode_batch_fast``, ``ByteOffsets.offsets``, ``stacked_masks``), interleaved,
best of ``--repeat``; the two give the same arrays (checked), and ``ByteOffsets.of`` is timed once.

    python bench/bench_chat_worker.py [--conversations 4096] [--chunk 1024] [--repeat 7]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # before tokenizers loads: one thread, as in a render worker

import numpy as np

from bench_chat_tokenize import CHATML, chat_files  # bench/ is on sys.path
from bench_records import table


def cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, default in (("--conversations", 4096), ("--chunk", 1024), ("--repeat", 7)):
        parser.add_argument(flag, type=int, default=default)
    args = parser.parse_args()
    from tokenizers import Tokenizer

    from umlos_cuda.batching.chat.byte_offsets import ByteOffsets
    from umlos_cuda.batching.chat.chunks import ChatRender
    from umlos_cuda.batching.chat.template import chat_template_of
    from umlos_cuda.batching.lengths.encoder import ChunkEncoder
    from umlos_cuda.batching.records.chunk import RecordChunk, RowIds
    from umlos_cuda.batching.tokens.writer import encode_chunk

    folder = tempfile.mkdtemp(prefix="bench-chat-worker-")
    try:
        chats, models, _ = chat_files(folder, args.conversations, 8000, {"model": CHATML})
        template = chat_template_of(models["model"])
        tokenizer = Tokenizer.from_file(os.path.join(models["model"], "tokenizer.json"))
        start = cpu()
        rendered = [ChatRender(template)([chats[i:i + args.chunk]])[0][0]
                    for i in range(0, len(chats), args.chunk)]
        render = cpu() - start
        chunks = [RecordChunk(RowIds(0, len(texts)), [texts], 0, 0) for texts in rendered]
        start = cpu()
        ByteOffsets.of(tokenizer)
        setup = cpu() - start
        from_ids = ChunkEncoder(tokenizer, "chat")
        assert from_ids.byte_offsets is not None
        own = ChunkEncoder(tokenizer, "chat")
        own.__dict__["byte_offsets"] = None  # the cached property, as for a tokenizer it does not cover
        sources = {"the tokenizer's offsets": own, "offsets from the ids": from_ids}
        best = dict.fromkeys(sources, float("inf"))
        for _ in range(args.repeat):
            for name, source in sources.items():
                start = cpu()
                for chunk in chunks:
                    encode_chunk(source, chunk, np.dtype("<u2"))
                best[name] = min(best[name], cpu() - start)
        for chunk in chunks:
            mine, theirs = (encode_chunk(source, chunk, np.dtype("<u2")) for source in sources.values())
            assert all(np.array_equal(a, b) for a, b in zip(mine, theirs)), "the two ways differ"
        count = len(chats)
        print(f"{count:,} conversations in chunks of {args.chunk:,}, CPU ms a record, best of {args.repeat} "
              f"interleaved; ByteOffsets.of once: {setup * 1e3:.1f} ms; load average "
              f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
        table("a render worker's record", ("step", "ms a record"),
              [("render (ChatRender)", f"{render * 1e3 / count:.3f}"),
               *((f"encode_chunk, {name}", f"{seconds * 1e3 / count:.3f}") for name, seconds in best.items())])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
