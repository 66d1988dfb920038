#include "tests/integration/workers/workers_fixture.h"

namespace tokenselect::testing {

std::string* WorkersTest::model_dir_ = nullptr;
engine::LoadedModel* WorkersTest::loaded_ = nullptr;

}  // namespace tokenselect::testing
