/* The C interface of libbaton_sentencepiece.so (shim.cpp): what src/tokenizer.cpp calls through
 * dlmopen. Buffers it returns (model, ids, text, piece, error) are freed with baton_spm_free, in
 * the shim's own namespace (it has its own allocator). */
#ifndef BATON_SENTENCEPIECE_SHIM_H
#define BATON_SENTENCEPIECE_SHIM_H
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { BATON_SPM_NORMAL = 0, BATON_SPM_UNKNOWN = 1, BATON_SPM_CONTROL = 2, BATON_SPM_BYTE = 3 };

/* Trains a model on n texts with SentencePieceTrainer's key = value arguments. 0: done. */
int baton_spm_train(const char* const* texts, const size_t* lengths, size_t n, const char* const* keys,
                    const char* const* values, size_t n_args, char** model, size_t* model_size, char** error);
/* A processor of a serialized model, or NULL (error set). */
void* baton_spm_load(const char* model, size_t size, char** error);
void baton_spm_unload(void* handle);
int baton_spm_pieces(const void* handle);
/* The piece of an id and its kind (BATON_SPM_*). 0: done. */
int baton_spm_piece(const void* handle, int id, char** piece, int* kind);
/* 0: unknown, 1: padding, 2: end of sentence, 3: beginning of sentence (-1: none). */
int baton_spm_special(const void* handle, int which);
int baton_spm_encode(const void* handle, const char* text, size_t size, int** ids, size_t* n);
int baton_spm_decode(const void* handle, const int* ids, size_t n, char** text, size_t* size);
void baton_spm_free(void* p);

#ifdef __cplusplus
}
#endif
#endif
