#include "shardtrain/data/formats/column_table.h"

namespace shardtrain::data {

int ColumnTable::column(const std::string& path) const {
  const std::vector<TableColumn>& all = columns();
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].path == path) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace shardtrain::data
