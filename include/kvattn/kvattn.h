// kvattn: attention engine for LLM inference serving. Include this one header.
#pragma once

#include "kvattn/attention.h"
#include "kvattn/cascade.h"
#include "kvattn/dtype.h"
#include "kvattn/error.h"
#include "kvattn/formats.h"
#include "kvattn/ops.h"
#include "kvattn/tensor.h"
#include "kvattn/variant.h"
#include "kvattn/version.h"
