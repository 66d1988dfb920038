# Writes OUTPUT, a C++ file defining the bytes of INPUT (see training_corpus.h).
file(READ ${INPUT} hex HEX)
string(LENGTH "${hex}" hex_length)
math(EXPR size "${hex_length} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
# Break the initializer into lines of 24 bytes.
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){24})" "\\1\n    " bytes "${bytes}")
file(WRITE ${OUTPUT}.tmp
  "// Generated from tokenizer/data/training_corpus.txt by tokenizer/embed_corpus.cmake.\n"
  "#include <cstddef>\n\n"
  "namespace tokenselect::tokenizer::internal {\n"
  "extern const unsigned char kTrainingCorpusData[] = {\n    ${bytes}0x00};\n"
  "extern const size_t kTrainingCorpusSize = ${size};\n"
  "}  // namespace tokenselect::tokenizer::internal\n")
file(COPY_FILE ${OUTPUT}.tmp ${OUTPUT} ONLY_IF_DIFFERENT)
