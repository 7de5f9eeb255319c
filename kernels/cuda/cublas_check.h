// CUBLAS_CHECK: the cuBLAS member of the one error family (core/error.h). Never compiled out.
#pragma once

#include <cublas_v2.h>

#include "core/error.h"

#define CUBLAS_CHECK(stmt)                                                                             \
    do {                                                                                               \
        const cublasStatus_t st_ = (stmt);                                                             \
        SHARDLM_CHECK_GEN("cuBLAS", st_ == CUBLAS_STATUS_SUCCESS, #stmt, cublasGetStatusString(st_)); \
    } while (0)
